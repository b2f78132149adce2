"""Every committed record names the processor that trained it, as the history says."""

from tests.helpers import load_script


def test_every_record_names_its_processor():
    """train.cpu (machine.cpu for the demo and serving reports): the evidence table's value
    for the records made before the tools kept it, the tools' own for the others."""
    assert load_script("mark_record_cpus").main(["--check"]) == 0
