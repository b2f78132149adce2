"""What the docs list of the code is what the code has: the values a sweep's grid takes."""

from __future__ import annotations

import re

from fairseq_tying.core.models.tying import TYING_MODES
from fairseq_tying.core.output_layers import OUTPUT_LAYERS
from fairseq_tying.studies.engine.specs import PRESS_WOLF
from tests.helpers import REPO


def _listed(text: str, key: str) -> tuple[str, ...]:
    """The values a doc lists for ``key`` as ``key`` (`a`/`b`/...)."""
    found = re.search(rf"`{key}` \(((?:`\w+`/?)+)\)", text)
    assert found, f"no list of {key} values"
    return tuple(re.findall(r"`(\w+)`", found.group(1)))


def test_slurm_md_lists_every_output_layer_and_tying_a_grid_takes():
    text = (REPO / "docs" / "slurm.md").read_text()
    assert _listed(text, "output_layer") == tuple(OUTPUT_LAYERS)
    assert _listed(text, "tying") == tuple(TYING_MODES)


DOC_PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "docs").glob("*/answer.md")))
# an author-year citation: "Liu et al. (2020)", "Press & Wolf (2017, Tables 2–3)",
# "Gulordava et al., 2018", "Nguyen & Chiang 2018", "Gemma Team 2024"
CITATION = re.compile(r"\b([A-Z][\w-]+(?: et al\.| & [A-Z][\w-]+| Team))(?:'s)?,? \(?"
                      r"((?:19|20)\d\d)\b")
# Liu et al.'s Transformer BLEU on IWSLT'14 Es→En, which no page sets beside ours any more
PAPER_BLEU = ("34.24", "34.65", "34.97", "34.54", "34.81")


def _references() -> dict[tuple[str, str], str]:
    """docs/results.md's References: each entry (``- **Name (YEAR)**. …``) by its key."""
    text = (REPO / "docs" / "results.md").read_text()
    section = text.split("\n## References\n", 1)[1].split("\n## ", 1)[0]
    items = [" ".join(item.split()) for item in section.split("\n- ")[1:]]
    entries = [re.match(r"\*\*(.+?) \(((?:19|20)\d\d)\)\*\*\. (.+)$", item) for item in items]
    assert all(entries), items
    return {(m.group(1), m.group(2)): m.group(3) for m in entries}


def _tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of ``text``: its rows (the header first), each row's cells."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append([rows[0], *rows[2:]])
            rows = []
    return tables


def test_every_paper_the_docs_cite_has_a_full_reference():
    """Each author-year citation of README.md and the docs, and each source the studies'
    tables print (the output layers' citations, Press & Wolf's), has its entry in
    docs/results.md's References: authors, title, venue or arXiv, and where its figures are."""
    refs = _references()
    assert len(refs) >= 8
    for (name, _), entry in refs.items():
        assert any(at in entry for at in ("arXiv:", "aclanthology.org", "doi.org/")), name
    cited = {(m.group(1), m.group(2)): page.relative_to(REPO) for page in DOC_PAGES
             for m in CITATION.finditer(page.read_text())}
    printed = {layer.citation for layer in OUTPUT_LAYERS.values()} | {PRESS_WOLF}
    for source in printed:
        m = CITATION.match(source)
        assert m, f"{source!r} is not an author-year citation"
        cited[(m.group(1), m.group(2))] = "a study table's source"
    missing = {f"{n} ({y}) in {where}" for (n, y), where in cited.items() if (n, y) not in refs}
    assert not missing, sorted(missing)
    assert CITATION.findall("Liu et al. (2020); Nguyen & Chiang 2018; Gulordava et al., 2018; "
                            "Press & Wolf's (2017); Gemma Team 2024; December 2020") == [
        ("Liu et al.", "2020"), ("Nguyen & Chiang", "2018"), ("Gulordava et al.", "2018"),
        ("Press & Wolf", "2017"), ("Gemma Team", "2024")]


def test_no_doc_sets_a_papers_bleu_beside_ours_or_calls_a_paper_contradicted():
    """Beside our figures a paper gives its Δ only (its BLEU is another corpus's and model's),
    FixNorm's +1.1 is named as what Nguyen & Salazar measured, and a paper's claim that a
    counted difference goes against reads "not replicated here", never "contradicted"."""
    for page in DOC_PAGES:
        text = page.read_text()
        assert "paper BLEU" not in text, page
        for table in _tables(text):
            header = " ".join(table[0])
            if "paper" in header:
                assert not any(c.startswith(PAPER_BLEU) for row in table for c in row), page
            if "source" in table[0] and "verdict" in table[0]:
                verdicts = [row[table[0].index("verdict")] for row in table[1:]]
                assert not any(v.startswith("contradicted") for v in verdicts), page
        for paragraph in re.split(r"\n\s*\n|\n- ", text):
            if "+1.1 " in paragraph:
                words = " ".join(paragraph.split())
                assert "PreNorm + ScaleNorm + FixNorm" in words, (page, words[:120])
