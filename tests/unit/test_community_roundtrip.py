"""Property: any valid serve profile either exports to both formats and imports back to the same vLLM argv,
or is refused in one paragraph saying what the format's tool would change (never exported wrong)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sparkforge.errors import RecipeError
from sparkforge.recipe.community.fromprofile import Pins, check_export, export_document, export_text
from sparkforge.recipe.profile import Profile, ProfileModel

_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-1, max_value=2**40),
    st.floats(min_value=0, max_value=1e12, allow_nan=False),
    st.text(max_size=24),
    st.sampled_from(
        ['{"mode": 3}', "'quoted'", "a b", "x{name}y", "$(id)", "a;b|c>d", "0.80", "1e5", "", "\u2028"]
    ),
)
_values = st.one_of(
    _scalars, st.lists(st.one_of(st.integers(0, 99), st.text(max_size=8)), min_size=1, max_size=3)
)
_keys = st.one_of(
    st.sampled_from(
        ["max-model-len", "tp", "compilation-config.mode", "no-enable-prefix-caching", "max_num_seqs"]
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.0123456789", min_size=1, max_size=16),
)
_env = st.dictionaries(st.sampled_from(["A", "VLLM_X", "NCCL_Y"]), st.text(max_size=16), max_size=2)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.dictionaries(_keys, _values, max_size=4), env=_env, served=st.sampled_from([None, "api-name"]))
def test_any_profile_round_trips_or_is_refused(args: dict, env: dict, served: str | None) -> None:
    try:
        model = ProfileModel.model_validate(
            {"description": "d", "model": "org/m", "args": args, "env": env, "served_model_name": served}
        )
    except ValidationError:
        return
    profile = Profile("p", Path("p.yaml"), model, {})
    for fmt in ("sparkarena", "eugr"):
        try:
            text = export_text(export_document(profile, fmt, Pins("img:1")), [])
        except RecipeError as exc:
            assert "cannot be written as a" in str(exc) and "fix:" in str(exc)
            continue
        check_export(
            text, fmt, profile, Pins("img:1")
        )  # raises RecipeError("... sparkforge bug") on a mismatch


_words = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["-tp", "--x", "--x=1", "-O", "-O3", "-cc.mode", "--a.b", "--no-y", "'", '"', "\\", "{p}", "{{"]
    ),
    st.sampled_from(
        ["{", "}", "$", ";", "|", "#", "--", "-", "\n", "\\\n", "--port", "--host", "99999", "-1"]
    ),
)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(_words, max_size=8),
    defaults=st.dictionaries(st.sampled_from(["p", "port", "q"]), st.text(max_size=6)),
)
def test_any_command_imports_or_is_refused_in_one_paragraph(
    tmp_path_factory, words: list, defaults: dict
) -> None:
    import yaml

    from sparkforge.recipe.community.formats import read_community
    from sparkforge.recipe.community.toprofile import import_recipe, write_profile
    from sparkforge.recipe.community.vllmargv import FALLBACK_ALIASES
    from sparkforge.recipe.yamlfile import read_yaml

    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    doc = {"recipe_version": "1", "name": "n", "container": "c", "defaults": defaults}
    doc["command"] = "vllm serve org/m " + " ".join(words)
    path.write_text(yaml.safe_dump(doc))
    try:
        imported = import_recipe(read_community(read_yaml(path), str(path)), aliases=FALLBACK_ALIASES)
        write_profile(imported, path.parent / "out" / "p.yaml")
    except RecipeError as exc:
        assert str(exc).startswith(str(path)) and "fix:" in str(exc), str(exc)
