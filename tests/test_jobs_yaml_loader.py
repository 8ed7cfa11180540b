"""The jobs file's YAML reader (cost.jobs._load_yaml) reads with libyaml where it can: its answer
is held to PyYAML's own pure-Python SafeLoader (the reference: yaml.load(text, yaml.SafeLoader)),
and a file with an alias, or an error, gets the pure-Python loader's words, with or without libyaml."""

from pathlib import Path

import pytest
import yaml
from conftest import fast_one

from planner.cost import jobs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TEXTS = [
    (EXAMPLES / "jobs.yaml").read_text(),
    "jobs:\n  - {name: a, model: gpt2, tokens: 1e9, deadline: 30d, gpus: [4090]}\n",
    "a: &x [1, 2]\nb: 3\n",          # an anchor with no alias: allowed
    "",                              # an empty document: None
    "x: !!binary aGk=\ny: 2024-01-02\nz: 0x1f\nw: .inf\n",
]
REFUSED = [("a: &x [1]\nb: *x\n", "aliases (*x) are not allowed in a jobs file, line 2"),
           ("a: &x [*x]\n", "aliases (*x)"),
           ("a: &x 1\nb: [*x]\n", "aliases (*x)"),
           ("<<: *u\n", "aliases (*u)"),
           ("jobs: [\n", "while parsing a flow node"),
           ("x: 1\n---\ny: 2\n", "expected a single document")]


@pytest.mark.parametrize("libyaml", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_the_same_document_as_pyyamls_safe_loader(text, libyaml, monkeypatch):
    if not libyaml:
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert jobs._load_yaml(text) == yaml.load(text, Loader=yaml.SafeLoader)


@pytest.mark.parametrize("libyaml", [True, False])
@pytest.mark.parametrize(("text", "words"), REFUSED)
def test_aliases_and_errors_in_the_pure_loaders_words(text, words, libyaml, monkeypatch):
    if not libyaml:
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    with pytest.raises(yaml.YAMLError) as e:
        jobs._load_yaml(text)
    assert words in str(e.value)


# the 400,000-deep brackets take 2 s: the full suite runs them, the fast tier the other three
@pytest.mark.parametrize("text", fast_one(["- " * 3000 + "x\n", "[" * 400_000 + "]" * 400_000, 'x: "\x01"\n',
                                           "a:\n\tb: 1\n"], "- " * 3000 + "x\n", 'x: "\x01"\n', "a:\n\tb: 1\n"))
def test_hostile_files_fail_as_in_the_pure_loader(text, monkeypatch):
    # deep nesting and special characters: the same exception and words as PyYAML's pure-Python
    # loader alone (with libyaml taken away), never a crash of the C parser
    def failure() -> tuple[str, str]:
        try:
            jobs._load_yaml(text)
        except Exception as e:  # noqa: BLE001 - RecursionError or a YAMLError, compared below
            return type(e).__name__, str(e).splitlines()[0]
        raise AssertionError("accepted")

    with_libyaml = failure()
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert with_libyaml == failure()
