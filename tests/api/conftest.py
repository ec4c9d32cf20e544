"""The API tier: the app in-process against a fake manager (`tests.support.fake_app`), and
the official SDKs against it. No model server is started here."""

from tests.support.fake_app import builder, tok  # noqa: F401  (fixtures)
