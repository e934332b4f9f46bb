"""The Secrets ``fastgshare cluster up`` makes are what the components accept."""

from __future__ import annotations

from fastgshare import keys
from fastgshare.assignment_signature import MIN_KEY_BYTES, check_key
from fastgshare_cluster import identities


def test_the_assignment_key_is_text_no_reader_trims_below_its_length() -> None:
    # 32 raw random bytes began or ended with a whitespace byte about one time in twenty, and the
    # extender, which trims a key file's newline, then refused to start (31 bytes)
    for _ in range(200):
        key = identities.assignment_key()[keys.ASSIGNMENT_KEY_SECRET_KEY]
        assert check_key(key, "key") == key
        assert len(key) >= MIN_KEY_BYTES
