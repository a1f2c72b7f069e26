import pytest

from rlstruct._redact import redact_credentials


@pytest.mark.parametrize("text, expected", [
    ("http://alice:s3cret@host:5000", "http://***@host:5000"),
    ("https://TOKEN@host/path", "https://***@host/path"),
    ("postgresql+psycopg2://u:p@ss@db:5432/x", "postgresql+psycopg2://***@db:5432/x"),
    ("https://host/x?token=abc&page=2", "https://host/x?token=***&page=2"),
    ("https://host/x?page=2&Access_Token=abc#top", "https://host/x?page=2&Access_Token=***#top"),
    ("https://host/x?api_key=abc;apikey=def", "https://host/x?api_key=***;apikey=***"),
    ("url: /?token=abc/api/2.0/runs (refused)", "url: /?token=***/api/2.0/runs (refused)"),
    ("'http://a:b@h:1/' and 'https://c:d@k/'", "'http://***@h:1/' and 'https://***@k/'"),
    ("sqlite:////abs/path.db", "sqlite:////abs/path.db"),
    ("https://host/x?tokens=1&monkey=2", "https://host/x?tokens=1&monkey=2"),
    ("email alice@example.com about it", "email alice@example.com about it"),
])
def test_credentials_leave_every_url_and_the_rest_stays(text, expected):
    assert redact_credentials(text) == expected
