from humanfmt import naturalsize


def test_bytes():
    assert naturalsize(0) == "0 bytes"
    assert naturalsize(1) == "1 byte"
    assert naturalsize(999) == "999 bytes"


def test_decimal_units():
    assert naturalsize(1000) == "1.0 kB"
    assert naturalsize(3_500_000) == "3.5 MB"
    assert naturalsize(10**12) == "1.0 TB"


def test_binary_units():
    assert naturalsize(1024, binary=True) == "1.0 KiB"
    assert naturalsize(1536, binary=True) == "1.5 KiB"
    assert naturalsize(1023, binary=True) == "1023 bytes"


def test_precision():
    assert naturalsize(1_234_567, ndigits=2) == "1.23 MB"


def test_negative_sizes():
    assert naturalsize(-2_000) == "-2.0 kB"
