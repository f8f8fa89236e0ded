"""Storage URLs with a secret in each form the suite checks stays hidden (used by
``tests/faults/test_secrets.py``, ``tests/search/runtime/test_storage.py`` and
``test_workers.py``).

Each secret is made of random-looking tokens joined by the character under test; a token
that shows anywhere (an output, a file, a command line) is a leak, whatever form the
secret shows in (as written in the URL, decoded, or cut at the special character).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SecretUrl:
    """A storage URL form: ``where`` the secret goes (``userinfo`` or ``query``), the secret
    as the server gets it, and as the URL spells it."""

    form: str
    where: str
    secret: str
    spelled: str

    @property
    def tokens(self) -> list[str]:
        """The parts of the secret, none of which may show."""
        parts = [self.secret]
        for sep in "/@:%":
            parts = [q for p in parts for q in p.split(sep)]
        return [p for p in parts if p]

    def url(self, base: str) -> str:
        """``base`` (``scheme://user@host:port/db``, no password) with this secret."""
        if self.where == "userinfo":
            user, rest = base.split("@", 1)
            return f"{user}:{self.spelled}@{rest}"
        return f"{base}?application_name=geosearch-test&password={self.spelled}"

    def leaks(self, text: str | bytes) -> list[str]:
        """The tokens of the secret that ``text`` shows."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return [t for t in self.tokens if t in text]


FORMS = [
    SecretUrl("slash", "userinfo", "Kq7xRd/Zm4wTp", "Kq7xRd/Zm4wTp"),  # SQLAlchemy takes a raw /
    SecretUrl("colon", "userinfo", "Jd5pQa:Ny3kFu", "Jd5pQa:Ny3kFu"),  # and a raw :
    SecretUrl("at", "userinfo", "Hv2nLc@Bt9sWe", "Hv2nLc%40Bt9sWe"),  # an @ URL-encoded
    SecretUrl("percent", "userinfo", "Rw8mGz%Ec6tVb", "Rw8mGz%25Ec6tVb"),  # a % URL-encoded
    SecretUrl("all", "userinfo", "Tm2vKe/Wq8hYo:Zn4cBi@Dj5sAl%Ua9gPe",
              "Tm2vKe/Wq8hYo:Zn4cBi%40Dj5sAl%25Ua9gPe"),
    SecretUrl("query", "query", "Pf4hUy/Ls7dMk", "Pf4hUy/Ls7dMk"),  # ?password=
]
"""Every form a storage URL that opens carries its secret in."""

RAW_AT = SecretUrl("raw-at", "userinfo", "Xc3bNo@Yg6rIh", "Xc3bNo@Yg6rIh")
"""A raw ``@`` in the password: SQLAlchemy would end the password at it and take the rest
for the host; geosearch refuses the URL (with it masked) before connecting."""

ABSENT = "postgresql://me@127.0.0.1:9/x"
"""A PostgreSQL server that is not there (port 9 refuses the connection)."""
