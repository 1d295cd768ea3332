"""Invoke tasks for signing: sign (platform images, index, provenance), sign.attest (a verify or kernel report),
sign.tuf-timestamp (re-sign the TUF snapshot and timestamp), sign.install."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import RECIPE_HELP, SIGNING, Family, Signing, opt
from sparkforge.context import Session

MAX_JSON_BYTES = 16 * 1024 * 1024


def _read_json(path: str, what: str) -> dict:
    """A JSON object through the boundary (a regular file of bounded size, finite numbers), or a clear error."""
    from sparkforge.boundary import read_json

    return read_json(path, f"the {what} file", max_bytes=MAX_JSON_BYTES)


@task(
    families=(SIGNING,),
    help={
        "recipe": RECIPE_HELP,
        "published": "the JSON 'invoke publish --json' wrote (index digest and one digest per platform)",
    },
)
@user_errors
def images(c: Context, session: Session, signing: Signing, recipe: str, published: str) -> None:
    """Sign every platform image and the index that 'invoke publish' wrote; attest each image's provenance and SBOM."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.cosign import sign_published
    from sparkforge.registry.signinputs import parse_published

    loaded = load_recipe(recipe)
    index, platforms = parse_published(_read_json(published, "'invoke publish --json'"), published)
    cosign, signer = signing.tools(session)
    session.echo(f"sparkforge: signing {loaded.model.publish.repository}@{index} with {signer.describe()}")
    for signed in sign_published(loaded, index, platforms, cosign, signer):
        session.out(f"sparkforge: signed {signed.reference} ({signed.what})")
    from sparkforge.registry.buildprov import attest_published as attest_buildkit  # buildx builds' provenance
    from sparkforge.registry.publish import session_tools
    from sparkforge.registry.sbomtrust import attest_published  # each image's SBOM, read from its layers

    tools = session_tools(session, loaded, "sign")
    attested = attest_published(loaded, platforms, cosign, signer, tools)
    for signed in [*attested, *attest_buildkit(loaded, index, platforms, cosign, signer)]:
        session.out(f"sparkforge: attested {signed.reference} ({signed.what})")


def _decided(loaded, tools, published: str, platform: str, image: str) -> str:
    """The image to attest: derived from the merge job's record when --published is given (and --image, if
    given too, must be it), else --image."""
    if not published:
        return image
    from sparkforge.errors import SparkforgeError
    from sparkforge.registry.signinputs import published_image

    record = _read_json(published, "'invoke publish --json'")
    _, derived = published_image(loaded.model.publish.repository, record, published, platform, tools.fetch)
    if image and image != derived:
        raise SparkforgeError(
            f"--image {image} is not the {platform} image of the published index ({derived}); nothing was "
            "signed. fix: attest the image this run's merge job published"
        )
    return derived


@dataclass(frozen=True)
class Claim:
    """What sign.attest attests (exactly one): a verify report, a crash of verify, or a kernel report."""

    report: str = opt("", "the verify report ('invoke verify --report')")
    crashed: str = opt(
        "", "verify crashed and wrote no report: attest a failed report carrying this error instead"
    )
    kernels: str = opt(
        "", "a kernel report ('invoke kernels --json') of --image to attest instead of a verify report"
    )


@dataclass(frozen=True)
class Subject:
    """The platform image sign.attest attests: --image, or derived from --published (the merge job's record;
    with --image, they must agree), and its platform."""

    image: str = opt(
        "", "the verified platform image, repository@sha256:... ('image' in 'invoke pull --json')"
    )
    published: str = opt(
        "",
        "PATH: the merge job's 'invoke publish --json': the image is derived from its index in the registry (the sign job decides what it signs); with --image, they must agree",
    )
    platform: str = opt("linux/arm64", "the platform of the image (default: linux/arm64, the GPU job's)")


CLAIM = Family.of(Claim, "claim")
SUBJECT = Family.of(Subject, "subject")


@task(families=(SIGNING, CLAIM, SUBJECT), help={"recipe": RECIPE_HELP})
@user_errors
def attest(
    c: Context, session: Session, signing: Signing, claim: Claim, subject: Subject, recipe: str
) -> None:
    """Attach a signed in-toto attestation of a verify report to the platform image it verified.

    A failed report also revokes the image in the signed TUF targets (a registry writer cannot erase it),
    and every moving tag naming it leaves them; with --crashed, a minimal failed report with the error is attested (a crash revokes too).
    """
    from sparkforge.errors import SparkforgeError
    from sparkforge.oci import PLATFORMS, check_reference
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import tagtrust
    from sparkforge.registry.attest import attest_kernels, attest_report
    from sparkforge.registry.publish import session_tools
    from sparkforge.registry.signinputs import check_subject, parse_verify_report

    image, published, platform = subject.image, subject.published, subject.platform
    if image:
        check_reference("--image", image, need_digest=True)  # the boundary: before cosign or the registry
    elif not published:
        raise SparkforgeError("pass --published (the merge job's record) or --image REPOSITORY@sha256:...")
    if sum(map(bool, (claim.report, claim.crashed, claim.kernels))) != 1:
        raise SparkforgeError(
            "pass one of --report (the verify report), --crashed ERROR (verify wrote none) or --kernels (a "
            "kernel report)"
        )
    if not claim.kernels and platform not in PLATFORMS:
        raise SparkforgeError(f"--platform {platform[:80]!r}: use one of {', '.join(PLATFORMS)}")
    loaded = load_recipe(recipe)
    if claim.kernels:
        data = _read_json(
            claim.kernels, "'invoke kernels --json'"
        )  # the image ID binding is checked on attest
    elif claim.report:
        data = parse_verify_report(
            _read_json(claim.report, "'invoke verify --report'"), claim.report
        )  # before cosign
    cosign, signer = signing.tools(session)
    tools = session_tools(session, loaded, "attest")
    image = _decided(loaded, tools, published, platform, image)
    if claim.kernels:
        signed = attest_kernels(loaded, image, data, cosign, signer, tools)
    else:
        if published and claim.report:
            check_subject(data, image, claim.report)
        if claim.crashed:
            data = tagtrust.crashed_report(loaded, image, platform, claim.crashed, tools)
        signed = attest_report(loaded, image, data, cosign, signer, tools)
    session.out(f"sparkforge: attested {signed.reference} ({signed.what}) with {signer.describe()}")
    for tag in [] if claim.kernels else tagtrust.revoke_failed(loaded, image, data, tools):
        session.out(f"sparkforge: revoked {image} in the signed TUF targets; {tag} no longer names it")


@task(help={"workdir": "where the .deb and a private apt state go (default: build/cosign)"})
@user_errors
def install(c: Context, session: Session, workdir: str = "") -> None:
    """Install cosign from Debian trixie's archive (the .deb only; the system is not upgraded). Idempotent."""
    import shutil

    from sparkforge.commands import Runner
    from sparkforge.imagebuild.hostsetup import debian_mirror
    from sparkforge.recipe.loader import REPO_ROOT
    from sparkforge.registry.cosigninstall import install_cosign

    if shutil.which("cosign"):
        session.out(f"sparkforge: cosign already installed ({shutil.which('cosign')})")
        return
    folder = Path(workdir) if workdir else REPO_ROOT / "build" / "cosign"
    folder.mkdir(parents=True, exist_ok=True)
    logged = session.with_runner(
        Runner(log_dir=folder / "logs", echo=session.echo)
    )  # the .deb's own log folder
    version = install_cosign(logged, debian_mirror(), folder)
    session.out(next((ln for ln in version.splitlines() if ln.startswith("GitVersion")), "cosign installed"))


@task(
    help={"recipe": "re-sign only this recipe's repository (default: every signing recipe in recipes/)"},
    iterable=["recipe"],
)
@user_errors
def tuf_timestamp(c: Context, session: Session, recipe: list[str] | None = None) -> None:
    """Re-sign the TUF snapshot and timestamp of each signing recipe's repository (daily; they expire).

    Signs with $SPARKFORGE_TUF_SIGNER (docs/trust.md); refuses, like every TUF write, a registry that serves
    older metadata than this machine trusts.
    """
    from sparkforge.recipe.loader import RECIPES_DIR, load_recipe
    from sparkforge.registry.cosign import Policy
    from sparkforge.registry.tufclient import root_file_of
    from sparkforge.registry.tufrepo import committed_dir, resign_timestamp

    names = recipe or sorted(p.stem for p in RECIPES_DIR.glob("*.yaml") if not p.name.startswith("_"))
    signing = {
        r.model.publish.repository: r for r in map(load_recipe, names) if Policy.for_verify(r) is not None
    }
    repositories = sorted(signing)
    for repository in repositories:
        resign_timestamp(repository, root_file=root_file_of(signing[repository]))
        session.out(
            f"sparkforge: re-signed the TUF metadata of {repository} from the committed metadata; commit and push "
            f"{committed_dir(repository)} (git is the source of truth)"
        )
    if not repositories:
        session.out("sparkforge: no signing recipe: nothing to re-sign")


ns = Collection("sign")
ns.add_task(images, "images", default=True)
ns.add_task(attest)
ns.add_task(tuf_timestamp, "tuf-timestamp")
ns.add_task(install)
