"""The dtypes a measuring model may run in, as stored with every replay row and probe run.

Defined here, apart from the model settings, because the database stores them too (``db.replays`` checks a row's
dtype against them) and may reach nothing of the runner but its stored words: this module imports nothing of ours.
Which one a run takes (``auto``: what this machine computes fastest) is ``measure.measuring_dtype``'s business.
"""

#: what a measuring model may run in
MEASURING_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
#: the dtype a measurement called from code runs in unless told (the CLI's ``--dtype auto`` chooses per machine)
REFERENCE_DTYPE = "float32"


def check_measuring_dtype(dtype: str) -> str:
    """``dtype`` if a measuring model may run in it; ValueError naming ``MEASURING_DTYPES`` otherwise."""
    if dtype not in MEASURING_DTYPES:
        raise ValueError(f"unknown measuring dtype {dtype!r}; use {', '.join(MEASURING_DTYPES)}")
    return dtype
