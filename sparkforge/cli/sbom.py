"""Invoke task `sbom`: an image's bill of materials (SPDX 2.3), read from its layers. Thin: parse, call
sparkforge.verify.sbom (or the signed one from the registry), print."""

from __future__ import annotations

import json as _json

from invoke import Context

from sparkforge.cli import task, user_errors
from sparkforge.console import cell
from sparkforge.context import Session


@task(
    help={
        "image": "the image: local (NAME:TAG, or REPOSITORY@sha256:... as 'invoke pull' left it)",
        "json": "write the SPDX 2.3 JSON document here ('-': to standard output, nothing else printed)",
        "recipe": "with --signed: the recipe whose signer and repository to check",
        "signed": "print the SBOM attested (signed) in the registry for --image (REPOSITORY@sha256:...) instead",
    }
)
@user_errors
def sbom(
    c: Context, session: Session, image: str, json: str = "", recipe: str = "", signed: bool = False
) -> None:
    """What is inside an image, as a table or SPDX 2.3 JSON (an SBOM read from its layers).

    Debian packages, Python distributions (with RECORD hashes), CUDA libraries and the vLLM build (commit,
    patches, arch list)."""
    from sparkforge.boundary import write_output
    from sparkforge.errors import InputError
    from sparkforge.oci import check_reference
    from sparkforge.verify.sbom import image_sbom

    check_reference("--image", image, need_digest=signed)  # the boundary: before any engine or registry call
    if signed:
        if not recipe:
            raise InputError("--signed needs --recipe R (whose signing key and repository to check)")
        from sparkforge.recipe.loader import load_recipe
        from sparkforge.registry.sbomtrust import signed_sbom

        found = signed_sbom(session, load_recipe(recipe), image)
    else:
        found = image_sbom(image)
    if json:
        text = _json.dumps(found.to_spdx(), indent=1, sort_keys=True) + "\n"
        if json == "-":
            print(text, end="")
            return
        write_output(json, text, "--json")
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
    if json:
        session.out(f"wrote {json}")
