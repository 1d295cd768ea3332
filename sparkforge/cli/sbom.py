"""Invoke task `sbom`: an image's bill of materials (SPDX 2.3), read from its layers. Thin: parse, call
sparkforge.verify.sbom (or the signed one from the registry), print."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass

from invoke import Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import Family, opt
from sparkforge.console import cell
from sparkforge.context import Session


@dataclass(frozen=True)
class SbomFlags:
    """Where the SBOM comes from (the layers, or the signed copy) and what is written: SPDX JSON, release notes."""

    json: str = opt(
        "", "write the SPDX 2.3 JSON document here ('-': to standard output, nothing else printed)"
    )
    recipe: str = opt("", "with --signed: the recipe whose signer and repository to check")
    signed: bool = opt(
        False, "read the SBOM attested (signed) in the registry for --image (REPOSITORY@sha256:...) instead"
    )
    since: str = opt(
        "", "the previous release's image: write release notes of what changed inside from the two SBOMs"
    )
    notes: str = opt("", "with --since: write the release notes (Markdown) here (default: print them)")


SBOM = Family.of(SbomFlags, "wanted")


@task(
    families=(SBOM,),
    help={"image": "the image: local (NAME:TAG, or REPOSITORY@sha256:... as 'invoke pull' left it)"},
)
@user_errors
def sbom(c: Context, session: Session, wanted: SbomFlags, image: str) -> None:
    """What is inside an image, as a table or SPDX 2.3 JSON (an SBOM read from its layers).

    Debian packages, Python distributions (with RECORD hashes), CUDA libraries and the vLLM build (commit,
    patches, arch list)."""
    from sparkforge.boundary import write_output
    from sparkforge.errors import InputError
    from sparkforge.oci import check_reference

    check_reference(
        "--image", image, need_digest=wanted.signed
    )  # the boundary: before any engine or registry

    if wanted.since:
        check_reference("--since", wanted.since, need_digest=wanted.signed)
    if wanted.notes and not wanted.since:
        raise InputError("--notes needs --since OLD (the previous release's image to compare with)")
    if wanted.signed and not wanted.recipe:
        raise InputError("--signed needs --recipe R (whose signing key and repository to check)")
    found = _read(session, image, wanted.recipe, wanted.signed)
    if wanted.since:
        from sparkforge.verify.sbom import release_notes

        text = release_notes(
            _read(session, wanted.since, wanted.recipe, wanted.signed), found, wanted.since, image
        )
        if wanted.notes:
            write_output(wanted.notes, text, "--notes")
            session.out(f"wrote {wanted.notes}")
        else:
            session.out(text.rstrip())
        return
    if wanted.json:
        text = _json.dumps(found.to_spdx(), indent=1, sort_keys=True) + "\n"
        if wanted.json == "-":
            print(text, end="")
            return
        write_output(wanted.json, text, "--json")
    kinds = {k: sum(p.kind == k for p in found.packages) for k in ("deb", "python")}
    session.out(
        f"{image}: image {found.image_id[:19]}, recipe {found.recipe or '-'} ({found.recipe_hash[:12] or '-'}); "
        f"{kinds['deb']} Debian packages, {kinds['python']} Python distributions, {len(found.cuda)} CUDA libraries"
    )
    if found.vllm:
        v = found.vllm
        session.out(
            f"vLLM {v.version} commit {v.commit or '-'}; patches: {', '.join(v.patches) or 'none'}; "
            f"arch list: {' '.join(v.arch_list) or '-'}"
        )
    rows = [(p.kind, cell(p.name), cell(p.version), p.sha256[:12] or "-", p.location) for p in found.packages]
    rows += [
        ("cuda", c.path.rsplit("/", 1)[-1], "-", c.sha256[:12], c.path.rsplit("/", 1)[0]) for c in found.cuda
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0, 0, 0, 0]
    for r in rows:
        session.out(
            f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}"
        )
    if wanted.json:
        session.out(f"wrote {wanted.json}")


def _read(session: Session, image: str, recipe: str, signed: bool):  # -> verify.sbom.Sbom
    """An image's SBOM: the signed one attested in the registry (--signed), else read from its layers."""
    if signed:
        from sparkforge.recipe.loader import load_recipe
        from sparkforge.registry.sbomtrust import signed_sbom

        return signed_sbom(session, load_recipe(recipe), image)
    from sparkforge.verify.sbom import image_sbom

    return image_sbom(image)
