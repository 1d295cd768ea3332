"""The CA bundle preflight chose (SPARKFORGE_CA_BUNDLE, the one builds use) is the one its HTTP requests verify
with: requests would put REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE over a session's own `verify`. No network: requests'
own merge, and the `verify` it hands the transport adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from requests.adapters import HTTPAdapter

from sparkforge.preflight.fetch import make_fetcher

URL = "https://pypi.org/pypi/vllm/json"
BOGUS = "/nonexistent/bogus-ca.pem"


class _Recorder(HTTPAdapter):
    """The transport end of a request: records what requests passed it and answers `{}` without a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.verify: list[object] = []

    def send(self, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:  # type: ignore[override]
        self.verify.append(kwargs["verify"])
        response = requests.Response()
        response.status_code, response._content, response.url = 200, b"{}", str(request.url)
        response.request = request
        return response


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_the_chosen_bundle_wins_over_requests_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    chosen = tmp_path / "proxy-ca.pem"
    chosen.write_text("-----BEGIN CERTIFICATE-----\n")
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", str(chosen))
    monkeypatch.setenv(variable, BOGUS)
    fetcher = make_fetcher()
    assert fetcher.session.merge_environment_settings(URL, {}, None, None, None)["verify"] == str(chosen)
    recorder = _Recorder()
    fetcher.session.mount("https://", recorder)
    assert fetcher.get_json(URL, what="vLLM's index entry") == {}
    assert recorder.verify == [str(chosen)]


def test_without_a_chosen_bundle_requests_variables_still_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKFORGE_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", BOGUS)
    session = make_fetcher().session
    assert session.merge_environment_settings(URL, {}, None, None, None)["verify"] == BOGUS
    assert (
        session.merge_environment_settings(URL, {}, None, False, None)["verify"] is False
    )  # asked per request


def test_the_sessions_bundle_is_the_one_preflight_verifies_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's session (cli/families.py session_from) reads --ca-bundle, else $SPARKFORGE_CA_BUNDLE, once;
    the fetcher preflight makes from the session verifies with it, whatever the environment says later."""
    from sparkforge.cli.families import session_from

    def session(**given: object):
        return session_from(given)

    chosen, other = tmp_path / "proxy-ca.pem", tmp_path / "other-ca.pem"
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", str(chosen))
    assert session().ca_bundle == chosen and session(ca_bundle=str(other)).ca_bundle == other
    built = session(offline=True)
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", BOGUS)  # read when the session was built, not deep below
    fetcher = make_fetcher(offline=built.offline, ca_bundle=built.ca_bundle)
    assert fetcher.offline and fetcher.session.verify == str(chosen)
    monkeypatch.delenv("SPARKFORGE_CA_BUNDLE")
    assert session().ca_bundle is None
