"""Images: the base image's contents, task-image caching by content hash, clear errors for bad input."""

from __future__ import annotations

import pytest

from env.sandbox.container import Sandbox
from env.tasks.images import (
    BASE_IMAGE_TAG,
    ImageBuildFailed,
    ImageMissing,
    debian_mirror,
    ensure_task_image,
    task_image_tag,
)
from env.tasks.loading import Task, load_local_task
from tests.conftest import TEST_JOB, write_local_task


def test_debian_mirror_reads_deb822_sources(tmp_path):
    sources = tmp_path / "debian.sources"
    sources.write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\n"
        "Types: deb\nURIs: http://security.example\nSuites: bookworm-security\n"
    )
    assert debian_mirror(sources) == "http://mirror.example/debian"
    assert debian_mirror(tmp_path / "absent") == "http://deb.debian.org/debian"


def test_task_tag_follows_content(tmp_path):
    task = load_local_task(write_local_task(tmp_path))
    tag = task_image_tag(task, "sha256:base")
    assert tag.startswith("nexus-eval/task-calc__calc-1:")
    assert task_image_tag(task, "sha256:base") == tag
    assert task_image_tag(task, "sha256:other-base") != tag
    (tmp_path / "calc__calc-1" / "repo" / "calc" / "ops.py").write_text("def add(a, b):\n    return 0\n")
    assert task_image_tag(task, "sha256:base") != tag


@pytest.mark.docker
def test_base_image_has_python_pytest_and_git_identity(docker_client, base_image):
    assert base_image == BASE_IMAGE_TAG
    with Sandbox.start(base_image, job=TEST_JOB, client=docker_client) as box:
        out = box.run(
            "python -c 'import sys; print(sys.version_info[0])'; python -m pytest --version; "
            "git config user.name; git config user.email",
            workdir="/",
        ).output
    lines = out.splitlines()
    assert lines[0] == "3"
    assert lines[1].startswith("pytest ")
    assert lines[2:] == ["nexus-eval", "nexus-eval@localhost"]


@pytest.mark.docker
def test_task_image_is_cached_and_holds_one_commit(local_task, local_task_image, docker_client):
    assert ensure_task_image(local_task, docker_client) == local_task_image
    with Sandbox.start(local_task_image, job=TEST_JOB, client=docker_client) as box:
        assert box.run("git rev-list --count HEAD", workdir="/testbed").output.strip() == "1"
        assert box.run("git status --porcelain", workdir="/testbed").output == ""
        assert box.exists("/testbed/calc/ops.py")


@pytest.mark.docker
def test_setup_lines_run_at_build(tmp_path, docker_client, base_image):
    task = load_local_task(write_local_task(tmp_path, setup=["echo built > /opt/marker.txt"]))
    image = ensure_task_image(task, docker_client)
    with Sandbox.start(image, job=TEST_JOB, client=docker_client) as box:
        assert box.read_file("/opt/marker.txt") == b"built\n"
    docker_client.images.remove(image, force=True)


@pytest.mark.docker
def test_unbuildable_image_names_the_task(tmp_path, docker_client, base_image):
    task = load_local_task(write_local_task(tmp_path, instance_id="calc__broken-2", setup=["exit 3"]))
    with pytest.raises(ImageBuildFailed, match="calc__broken-2"):
        ensure_task_image(task, docker_client)


@pytest.mark.docker
def test_setup_has_no_network(tmp_path, docker_client, base_image):
    probe = "python3 -c \"import socket; socket.create_connection(('93.184.216.34', 80), timeout=3)\""
    task = load_local_task(write_local_task(tmp_path, instance_id="calc__net-3", setup=[probe]))
    with pytest.raises(ImageBuildFailed):
        ensure_task_image(task, docker_client)


@pytest.mark.docker
def test_missing_registry_image_says_how_to_get_it(docker_client):
    task = Task(
        instance_id="django__django-11099",
        repo="django/django",
        problem_statement="p",
        patch="",
        test_patch="",
        FAIL_TO_PASS=["t"],
        PASS_TO_PASS=[],
        kind="swebench",
        docker_image="swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
    )
    with pytest.raises(ImageMissing, match="docker pull swebench/sweb.eval.x86_64.django_1776_django-11099"):
        ensure_task_image(task, docker_client)
