"""The admin token file: created once with mode 0600, then shared by every caller."""

import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trellis_identity import tokens


def test_creates_a_private_token_file(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"

    token = tokens.load_or_create_admin_token(state_dir)

    path = tokens.token_path(state_dir)
    assert len(token) >= 32
    assert path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in state_dir.iterdir()] == [tokens.TOKEN_FILE]  # no temp file left


def test_the_next_call_returns_the_same_token(tmp_path: Path) -> None:
    first = tokens.load_or_create_admin_token(tmp_path)

    assert tokens.load_or_create_admin_token(tmp_path) == first


def test_reads_a_token_written_by_someone_else(tmp_path: Path) -> None:
    tokens.token_path(tmp_path).write_text("  from-the-cli \n")

    assert tokens.load_or_create_admin_token(tmp_path) == "from-the-cli"


def test_replaces_an_empty_token_file(tmp_path: Path) -> None:
    tokens.token_path(tmp_path).write_text("\n")

    token = tokens.load_or_create_admin_token(tmp_path)

    assert token
    assert tokens.load_or_create_admin_token(tmp_path) == token
    assert stat.S_IMODE(tokens.token_path(tmp_path).stat().st_mode) == 0o600


def test_the_configured_token_wins_and_writes_nothing(tmp_path: Path) -> None:
    assert tokens.load_or_create_admin_token(tmp_path, "from-settings") == "from-settings"
    assert not tokens.token_path(tmp_path).exists()

    on_disk = tokens.load_or_create_admin_token(tmp_path)
    assert tokens.load_or_create_admin_token(tmp_path, "from-settings") == "from-settings"
    assert tokens.load_or_create_admin_token(tmp_path, None) == on_disk


def test_concurrent_creators_agree_on_one_token(tmp_path: Path) -> None:
    for attempt in range(20):
        state_dir = tmp_path / f"race-{attempt}"
        workers = 8
        barrier = threading.Barrier(workers)

        def create(state_dir: Path = state_dir, barrier: threading.Barrier = barrier) -> str:
            barrier.wait()
            return tokens.load_or_create_admin_token(state_dir)

        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda _: create(), range(workers)))

        assert len(set(results)) == 1, f"attempt {attempt}: {results}"
        assert tokens.token_path(state_dir).read_text().strip() == results[0]
        assert [p.name for p in state_dir.iterdir()] == [tokens.TOKEN_FILE]


def test_a_service_keeps_only_the_digest_and_checks_bearers_against_it(tmp_path: Path) -> None:
    import hashlib

    import pytest

    digest = hashlib.sha256(b"s3cret").hexdigest()
    kept = tokens.admin_token(tmp_path, None, digest)
    assert kept.matches("s3cret")
    assert not kept.matches("s3cret ")
    assert not kept.matches("")
    assert "s3cret" not in repr(vars(kept))  # the service holds no token, only its digest
    assert not tokens.token_path(tmp_path).exists()  # given the digest: no token file made
    # without one, the token file's (made if missing) is hashed and the token dropped
    from_file = tokens.admin_token(tmp_path, None, None)
    assert from_file.matches(tokens.token_path(tmp_path).read_text().strip())
    assert tokens.admin_token(tmp_path, "configured", None).matches("configured")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        tokens.AdminToken("not-a-digest")
