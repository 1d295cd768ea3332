"""Every repository a profile reaches is pinned by the profile: hostile community recipes of both formats reach a
tokenizer, a drafter, a LoRA adapter, a config repository or auto_map code elsewhere (unpinned, at a branch, at
refs/pr/N, through a non-Hub URI, or pinned), through the real import, load and launch plan (no engine)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sparkforge.errors import ProfileError, RunError
from sparkforge.preflight.catalog import import_with, read_source
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.allowlist import opt_in_reason
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.profile import load_profile
from sparkforge.run.launch import LaunchOptions, check_model_pin, plan_launch
from sparkforge.run.weights.weights import download_lines, plan_downloads

MODEL_PIN = "3f1c0ffee0000000000000000000000000000000"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# kind -> (the flags the recipe adds, the repository it reaches, the entry import names)
KINDS = {
    "tokenizer": ("--tokenizer evil/tok", "evil/tok", "--tokenizer"),
    "drafter": ('--speculative-config \'{"method": "draft_model", "model": "evil/draft", "num_speculative_tokens": 2}\'',
                "evil/draft", "--speculative-config.model"),
    "drafter-dotted": ("--speculative-config.model evil/draft --speculative-config.method draft_model", "evil/draft",
                       "--speculative-config.model"),
    "lora": ("--enable-lora --lora-modules tools=evil/lora", "evil/lora", "--lora-modules"),
    "lora-json": ('--enable-lora --lora-modules \'{"name": "tools", "path": "evil/lora"}\'', "evil/lora",
                  "--lora-modules"),
    "config": ("--hf-config-path evil/cfg", "evil/cfg", "--hf-config-path"),
}  # fmt: skip
FORMATS = ("eugr", "sparkarena")


def _recipe(tmp_path: Path, fmt: str, tail: str) -> Path:
    path = tmp_path / f"{fmt}-r.yaml"
    if fmt == "eugr":  # the runner's templating: braces doubled, the port from defaults
        tail = tail.replace("{", "{{").replace("}", "}}")
        path.write_text(
            'recipe_version: "1"\nname: r\ndescription: d\ncontainer: c:1\ndefaults:\n  port: 8000\n'
            f"command: |\n  vllm serve q/m --revision {MODEL_PIN} --port {{port}} {tail}\n"
        )
    else:
        path.write_text(
            f"recipe_version: 2\nmodel: q/m\nmodel_revision: {MODEL_PIN}\ncontainer: c:1\ncommand: >-\n"
            f"  vllm serve {{model}} {tail}\n"
        )
    return path


def _import(path: Path, out: Path):
    imported = import_with(None, read_source(str(path), make_fetcher()))
    return imported, write_profile(imported, out, force=True)


def _options(**kw) -> LaunchOptions:
    return LaunchOptions(image="img", **kw)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_unpinned_repository_is_written_waiting_for_its_commit_and_refused_until_pinned(
    fmt: str, kind: str, tmp_path: Path
) -> None:
    tail, repo, entry = KINDS[kind]
    imported, out = _import(_recipe(tmp_path, fmt, tail), tmp_path / "p.yaml")
    named = [str(a) for a in imported.refused]
    assert any(
        f" {entry}: {repo} " in n and "refused until pinned" in n and "fix: write its full" in n
        for n in named
    )
    profile = load_profile(out)
    assert profile.model.repositories == {repo: None}
    with pytest.raises(RunError, match=f"{repo} .*has no pinned commit.*fix: write its full 40-hex commit"):
        check_model_pin(profile, _options())
    # The commit written in, the repository reaches vLLM only as its snapshot folder at the pin.
    out.write_text(out.read_text().replace(f"{repo}: null", f"{repo}: {COMMIT}"))
    profile = load_profile(out)
    check_model_pin(profile, _options())
    argv = plan_launch(profile, ["10.0.0.1"], [{}], _options()).head.container.args
    folder = f"/root/.cache/huggingface/hub/models--{repo.replace('/', '--')}/snapshots/{COMMIT}"
    assert any(folder in word for word in argv) and not any(repo in word for word in argv), argv
    assert argv[argv.index("--code-revision") + 1] == MODEL_PIN
    # The download container fetches the model and the repository, each at its own pin; the dry run says so.
    (download,) = plan_downloads(profile, [0], _options())
    assert download.container.args[2:] == ("q/m", MODEL_PIN, repo, COMMIT)
    assert f"download: {repo} at {COMMIT} from https://huggingface.co" in "\n".join(
        download_lines(profile, _options(), {0: "n0"}, dry=True)
    )
    # With the model in the owner's --model-dir the other repository is still fetched at its pin.
    (alone,) = plan_downloads(profile, [0], _options(model_dir=tmp_path))
    assert alone.container.args[2:] == (repo, COMMIT)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ref", ["main", "refs/pr/3", "v1.0", "0123abc"])
def test_a_branch_tag_pr_or_short_commit_is_refused(fmt: str, ref: str, tmp_path: Path) -> None:
    # In the recipe: --tokenizer-revision beside a tokenizer of its own; no opt-in lets it through.
    src = _recipe(tmp_path, fmt, f"--tokenizer evil/tok --tokenizer-revision {ref}")
    imported, out = _import(src, tmp_path / "p.yaml")
    assert any(
        " --tokenizer-revision: refused: " in str(a) and "no opt-in" in str(a) for a in imported.refused
    )
    assert ref not in "\n".join(line for line in out.read_text().splitlines() if not line.startswith("#"))
    # In the profile: the commit a repository is pinned to.
    out.write_text(out.read_text().replace("evil/tok: null", f"evil/tok: {ref}"))
    with pytest.raises(
        ProfileError, match=r"repositories: evil/tok: .* is a branch, tag or PR ref.*fix: write"
    ):
        load_profile(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_commit_in_the_recipe_pins_its_tokenizer(fmt: str, tmp_path: Path) -> None:
    imported, out = _import(_recipe(tmp_path, fmt, f"--tokenizer evil/tok --tokenizer-revision {COMMIT}"),
                            tmp_path / "p.yaml")  # fmt: skip
    assert not imported.refused
    profile = load_profile(out)
    assert profile.model.repositories == {"evil/tok": COMMIT}
    assert (
        profile.model.args["tokenizer-revision"] == MODEL_PIN
    )  # derived from the model's pin, not the recipe
    check_model_pin(profile, _options())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "tail",
    ["--tokenizer s3://bucket/tok", "--hf-config-path gs://b/cfg", "--enable-lora --lora-modules t=s3://b/lora",
     "--tokenizer /root/.cache/huggingface/hub/models--x/snapshots/c", "--lora-modules t=../../etc"],
)  # fmt: skip
def test_a_non_hub_uri_or_a_path_is_refused(fmt: str, tail: str, tmp_path: Path) -> None:
    imported, out = _import(_recipe(tmp_path, fmt, tail), tmp_path / "p.yaml")
    flag = shlex.split(tail)[-2]
    assert any(f" {flag}: refused: " in str(a) and "fix: " in str(a) for a in imported.refused), (
        imported.refused
    )
    profile = load_profile(out)
    assert flag.lstrip("-") not in profile.model.args and not profile.model.repositories
    if "://" in tail:  # a URI names the fetch as such
        assert any("a URI the loader fetches from elsewhere" in str(a) for a in imported.refused)


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_map_code_in_another_repository_is_refused(fmt: str, tmp_path: Path) -> None:
    tail = '--hf-overrides \'{"auto_map": {"AutoConfig": "evil/code--cfg.Config"}}\''
    imported, out = _import(_recipe(tmp_path, fmt, tail), tmp_path / "p.yaml")
    assert any(" --hf-overrides.auto_map: refused: " in str(a) for a in imported.refused)
    assert "evil/code" not in "\n".join(x for x in out.read_text().splitlines() if not x.startswith("#"))
    # Written by hand with an opt-in: still refused, no pin can hold it.
    out.write_text(
        f"description: d\nmodel: q/m\nargs:\n  revision: {MODEL_PIN}\n"
        '  hf-overrides: \'{"auto_map": {"AutoConfig": "evil/code--cfg.Config"}}\'\n'
        f"allow:\n  hf-overrides.auto_map: {opt_in_reason('reviewed', {'AutoConfig': 'evil/code--cfg.Config'})}\n"
    )
    with pytest.raises(ProfileError, match="loads code from evil/code, which no pin can hold"):
        load_profile(out)


def test_a_profile_lists_exactly_the_repositories_its_args_reach(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"description: d\nmodel: q/m\nargs:\n  revision: {MODEL_PIN}\n  tokenizer: evil/tok\n")
    with pytest.raises(ProfileError, match=r"args\.tokenizer: reaches evil/tok .*does not list; fix: write"):
        load_profile(path)
    path.write_text(
        f"description: d\nmodel: q/m\nargs:\n  revision: {MODEL_PIN}\nrepositories:\n  evil/tok: {COMMIT}\n"
    )
    with pytest.raises(ProfileError, match="evil/tok: no arg reaches it; fix: remove the entry"):
        load_profile(path)
    path.write_text(
        f"description: d\nmodel: q/m\nargs:\n  tokenizer: evil/tok\nrepositories:\n  s3://b/t: {COMMIT}\n"
    )
    with pytest.raises(ProfileError, match="is not a Hugging Face repository id"):
        load_profile(path)
    # The model itself is pinned by args.revision: naming it as its own tokenizer needs no entry.
    path.write_text(f"description: d\nmodel: q/m\nargs:\n  revision: {MODEL_PIN}\n  tokenizer: q/m\n")
    assert load_profile(path).model.repositories == {}
    # --weights skip would leave the snapshot unfetched: refused before anything starts.
    path.write_text(
        f"description: d\nmodel: q/m\nargs:\n  revision: {MODEL_PIN}\n  tokenizer: evil/tok\n"
        f"repositories:\n  evil/tok: {COMMIT}\n"
    )
    with pytest.raises(RunError, match="--weights skip"):
        check_model_pin(load_profile(path), _options(weights="skip"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_carries_the_pins_and_imports_back_with_the_tokenizers(fmt: str, tmp_path: Path) -> None:
    from sparkforge.recipe.loader import REPO_ROOT, load_recipe
    from sparkforge.registry.realize import export_community

    drafter = '{"method": "draft_model", "model": "evil/draft", "num_speculative_tokens": 2}'
    path = tmp_path / "p.yaml"
    path.write_text(
        f"description: d\nmodel: q/m\nargs:\n  revision: {MODEL_PIN}\n  tokenizer: evil/tok\n"
        f"  speculative-config: '{drafter}'\nrepositories:\n  evil/tok: {COMMIT}\n  evil/draft: {MODEL_PIN}\n"
    )
    recipe = load_recipe(str(REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"))
    text = export_community(load_profile(path), recipe, fmt, "img:1")  # imports it back, or raises
    assert f"# pinned: evil/tok at {COMMIT}" in text and f"# pinned: evil/draft at {MODEL_PIN}" in text
    out = tmp_path / f"{fmt}-back.yaml"
    out.write_text(text)
    imported, written = _import(out, tmp_path / "back.yaml")
    # The tokenizer's pin travels in --tokenizer-revision; the drafter's waits for its commit (named, refused).
    assert load_profile(written).model.repositories == {"evil/tok": COMMIT, "evil/draft": None}
    assert [a for a in imported.refused if "evil/draft" in str(a)]
