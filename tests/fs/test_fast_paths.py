"""``normalize_lexical``'s already-normal shortcut answers exactly like the segment walk."""

from __future__ import annotations


def _reference_normalize(path: str) -> str:
    """An independent oracle: keep named segments, let ``..`` drop the last kept one."""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            kept = kept[:-1]
        elif segment not in ("", "."):
            kept.append(segment)
    return "/" + "/".join(kept)


def test_normalize_lexical_shortcut_matches_the_segment_walk() -> None:
    """The already-normal shortcut gives exactly the segment walk's answer."""
    import random

    from exec_server.protocol.paths import normalize_lexical

    rng = random.Random(1234)
    alphabet = ["a", "b", ".", "..", "/", ".x", "x.", " ", "\\", "é"]
    for _ in range(20000):
        tail = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        for path in (tail, "/" + tail):
            assert normalize_lexical(path) == _reference_normalize(path), path
