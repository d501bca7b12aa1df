import pytest

from compilecache.cache import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200Gi", 200 * 2**30),
        ("1.5G", 1_500_000_000),
        ("512", 512),
        ("1e3", 1000),
        ("100Mi", 100 * 2**20),
        (7, 7),
    ],
)
def test_bytes_parse(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["200GB", "Gi", "", "1.2.3Gi", "-5Gi", True, "ten"])
def test_bytes_reject_malformed(text):
    with pytest.raises(ValueError):
        units.parse_bytes(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 604800), ("12h", 43200), ("1h30m", 5400), ("90s", 90), ("1w", 604800)]
)
def test_duration_parse(text, seconds):
    assert units.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7days", "", "d", "1.5", "-1h", "1h 30m", 7])
def test_duration_reject_malformed(text):
    with pytest.raises(ValueError):
        units.parse_duration(text)


@pytest.mark.parametrize("text", ["0 3 * * *", "*/15 * * * *", "0 0 1,15 * mon-fri", "0 3 ? * *"])
def test_cron_accepts_five_fields(text):
    assert units.check_cron(text) == text


@pytest.mark.parametrize("text", ["0 3 * *", "every day", "0 3 * * * *", "", "@daily"])
def test_cron_rejects(text):
    with pytest.raises(ValueError):
        units.check_cron(text)


@pytest.mark.parametrize(("count", "text"), [(0, "0"), (1023, "1023"), (1536, "1.5Ki"), (12 * 2**30, "12Gi")])
def test_format_bytes(count, text):
    assert units.format_bytes(count) == text
