from datetime import date, datetime, timedelta, timezone

from humanfmt import naturalday, naturaltime

NOW = datetime(2024, 3, 10, 12, 0, tzinfo=timezone.utc)


def test_just_now():
    assert naturaltime(NOW - timedelta(seconds=3), now=NOW) == "just now"


def test_past():
    assert naturaltime(NOW - timedelta(minutes=5), now=NOW) == "5 minutes ago"
    assert naturaltime(NOW - timedelta(days=1), now=NOW) == "1 day ago"


def test_future():
    assert naturaltime(NOW + timedelta(hours=2), now=NOW) == "in 2 hours"


def test_rounds_to_nearest_unit():
    assert naturaltime(NOW - timedelta(minutes=90), now=NOW) == "2 hours ago"


def test_naive_datetimes_are_utc():
    naive_now = NOW.replace(tzinfo=None)
    assert naturaltime(naive_now - timedelta(minutes=3), now=naive_now) == "3 minutes ago"
    assert naturaltime(naive_now - timedelta(minutes=3), now=NOW) == "3 minutes ago"


def test_naturalday():
    today = date(2024, 3, 10)
    assert naturalday(today, today) == "today"
    assert naturalday(date(2024, 3, 9), today) == "yesterday"
    assert naturalday(date(2024, 3, 11), today) == "tomorrow"
    assert naturalday(date(2024, 1, 1), today) == "2024-01-01"
