"""parse() skips the lines of families it does not read with one startswith (expfmt._unread_heads): the
result must be exactly the one of reading every line, on pages built to trip a skip that is too eager.

The pages mix kept names with unread families whose names are their prefixes or extensions, samples of
kept names with no TYPE of their own right after an unread family, `{__name__=...}` lines, HELP/TYPE in
odd spellings, leading whitespace, tabs, blank lines, timestamps, exemplars and bad values.
"""

from __future__ import annotations

import random

import pytest

from rooflight.collectors import expfmt

KEPT = ("e:a", "e:a_total", "e:ab_bucket", "e:ab_count", "e:ab_sum", "e:g", "e:x_created")
UNREAD = ("e:", "e:ab", "e:a_b", "e:a_totals", "e:gg", "e:x", "e:zz", "other_total")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "info")


def _family_lines(rng: random.Random, family: str) -> list[str]:
    typ = rng.choice(TYPES)
    lines = []
    for kind, text in (("HELP", "Some help."), ("TYPE", typ)):
        spelling = rng.choice((f"# {kind} {family} {text}", f"#  {kind} {family} {text}", f"#x\t{kind}\t{family}\t{text}",
                               f"# {kind} {family}", f"  # {kind} {family} {text}"))
        if rng.random() < 0.8:
            lines.append(spelling)
    for _ in range(rng.randint(0, 5)):
        lines.append(_sample(rng, family + rng.choice(("", "_bucket", "_count", "_sum", "_total", "_created", "_info"))))
    return lines


def _sandwich(rng: random.Random) -> list[str]:
    """An unread family's line where it is not a no-op: inside an open kept family (it closes it), or its
    comment after an untyped kept run (it ends the run's one Family, under Bounds)."""
    unread, kept = rng.choice(UNREAD[1:-1]), rng.choice(KEPT)
    if rng.random() < 0.5:
        return [f"# TYPE {unread} gauge", f"{unread} 1", f"# TYPE {kept} gauge", f"{kept} 2", f"{unread} 3",
                f"{kept} 4"]
    return [f"# TYPE {unread} gauge", f"{kept} 5", f"# TYPE {unread} gauge", f"{kept} 6"]


def _sample(rng: random.Random, name: str) -> str:
    labels = rng.choice(("", '{a="1"}', '{le="0.5",a="x"}', '{a="}"}', '{a="q\\"uote"}', '{ a = "s" }'))
    value = rng.choice(("1", "2.5", "NaN", "+Inf", "1_0", "", "3 1700000000000", "4 # {t=\"1\"} 1", "x"))
    sep = rng.choice((" ", " ", "\t", "  "))
    lead = rng.choice(("", "", "", " ", "\t"))
    if rng.random() < 0.05:
        return f'{lead}{{__name__="{name}",a="1"}}{sep}{value}'
    return f"{lead}{name}{labels}{sep}{value}"


def _page(seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(rng.randint(3, 25)):
        roll = rng.random()
        if roll < 0.6:
            lines += _family_lines(rng, rng.choice(KEPT + UNREAD))
        elif roll < 0.7:
            lines.append(_sample(rng, rng.choice(KEPT + UNREAD)))  # a sample with no TYPE of its own
        elif roll < 0.8:
            lines += _sandwich(rng)
        else:
            lines.append(rng.choice(("", "   ", "# a comment", "#", "# EOF")))
    return "\n".join(lines) + rng.choice(("\n", ""))


def _comparable(sample: expfmt.Sample) -> tuple[object, ...]:
    """The sample with its numbers as their repr: a NaN equals a NaN."""
    return sample.name, sample.labels, repr(sample.value), repr(sample.timestamp)


def _read(text: str, bounds: expfmt.Bounds | None) -> tuple[object, ...]:
    exp = expfmt.parse(text, prefixes=("e:", "other"), names=KEPT, bounds=bounds)
    families = [(f.name, f.type, f.help, [_comparable(s) for s in f.samples]) for f in exp.families]
    by_name = {k: [_comparable(s) for s in v] for k, v in exp.by_name.items()}
    return families, by_name, exp.bad_lines, exp.samples_dropped, exp.labels_truncated


def _both(text: str, monkeypatch: pytest.MonkeyPatch, bounds: type[expfmt.Bounds] | None) -> tuple[object, object]:
    def fresh() -> expfmt.Bounds | None:
        return bounds(max_samples=6, max_labels=20) if bounds is not None else None

    try:
        skipping: object = _read(text, fresh())
    except expfmt.ParseError as exc:
        skipping = str(exc)
    with monkeypatch.context() as m:
        m.setattr(expfmt, "_unread_heads", lambda family, keep: ())  # read every line
        try:
            reading: object = _read(text, fresh())
        except expfmt.ParseError as exc:
            reading = str(exc)
    return skipping, reading


@pytest.mark.parametrize("seed", range(300))
def test_skipping_unread_families_changes_nothing(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _page(seed)
    for bounds in (None, expfmt.Bounds):
        skipping, reading = _both(text, monkeypatch, bounds)
        assert skipping == reading, text


def test_the_pages_do_skip_lines_and_keep_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator exercises the skip: some lines start as an unread family's, and kept samples follow."""
    skipped = kept = 0
    for seed in range(300):
        text = _page(seed)
        heads = {f: expfmt._unread_heads(f, frozenset(KEPT)) for f in UNREAD}
        skipped += sum(1 for line in text.split("\n") for h in heads.values() if h and line.startswith(h))
        try:
            kept += sum(len(v) for v in _read(text, None)[1].values())  # type: ignore[union-attr]
        except expfmt.ParseError:
            continue
    assert skipped > 300 and kept > 300


def test_a_kept_name_extending_an_unread_family_is_not_skipped() -> None:
    page = "# TYPE e:ab histogram\ne:ab_bucket{le=\"+Inf\"} 3\ne:ab_other 1\n# TYPE e:a_totals counter\ne:a_total 7\n"
    exp = expfmt.parse(page, prefixes=("e:",), names=KEPT)
    assert [s.value for s in exp.get("e:ab_bucket")] == [3.0]
    assert [s.value for s in exp.get("e:a_total")] == [7.0]
