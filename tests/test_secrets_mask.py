"""The rules of what the wire shows of stored secrets (sidecar/secrets/mask.py) and of the
URL parts that hold them (sidecar/secrets/urls.py), and the Sealer's URL and body forms."""

from __future__ import annotations

from pathlib import Path

from sidecar.secrets.box import SecretBox
from sidecar.secrets.mask import MASK, mask_map, mask_url, unmask_map, unmask_url
from sidecar.store.secrets import BASE_URL, BODY, Sealer

URL = "https://user:p%40ss@api.example.test:8443/v1?key=sk-1&api-version=2024&key=sk-2&flag&empty=#frag"


def test_every_value_is_masked_and_names_stay() -> None:
    assert mask_map({"Authorization": "Bearer x", "X-Trace": "t", "": ""}) == {"Authorization": MASK, "X-Trace": MASK, "": MASK}
    assert mask_url(URL) == "https://***@api.example.test:8443/v1?key=***&api-version=***&key=***&***&empty=#frag"
    assert mask_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"
    assert mask_url("http://[::1/v1?key=x") == MASK  # does not parse: nothing of it is shown


def test_a_masked_listing_sent_back_keeps_the_stored_values() -> None:
    assert unmask_url(mask_url(URL), URL) == URL
    # an edit: a value replaced, one key dropped, one added, the userinfo kept
    assert unmask_url("https://***@api.example.test:8443/v2?key=***&key=new&extra=***", URL) == (
        "https://user:p%40ss@api.example.test:8443/v2?key=sk-1&key=new&extra=***"
    )
    stored = {"Authorization": "enc1:sealed", "X-Trace": "t"}
    assert unmask_map({"Authorization": MASK, "X-Trace": "u", "New": MASK}, stored) == {
        "Authorization": "enc1:sealed", "X-Trace": "u", "New": MASK,
    }


def test_sealed_url_parts_and_body_fields_open_to_what_was_given(tmp_path: Path) -> None:
    sealer = Sealer(SecretBox(tmp_path, use_keychain=False))
    sealed = sealer.seal_url(URL, BASE_URL)
    assert "sk-1" not in sealed and "p%40ss" not in sealed and "2024" not in sealed
    assert sealed.startswith("https://enc1%3A") and "@api.example.test:8443/v1?key=enc1%3A" in sealed
    assert sealer.seal_url(sealed, BASE_URL) == sealed  # sealing twice changes nothing
    assert sealer.open_url(sealed, BASE_URL) == (URL, False)
    body = {"api_key": "sk-3", "temperature": 0.25, "nested": {"a": [1, None]}, "flag": False}
    stored = sealer.seal_json_map(body, BODY)
    assert all(v.startswith("enc1:") for v in stored.values())
    assert sealer.open_json_map(stored, BODY, "p") == (body, False)
    assert sealer.open_json_map({"plain": 3}, BODY, "p") == ({"plain": 3}, False)  # an older version's row
    # a value sealed with a key this process was not given is left out, and says so
    (tmp_path / "other").mkdir()
    other = Sealer(SecretBox(tmp_path / "other", use_keychain=False))
    assert other.open_url(sealed, BASE_URL) == ("https://api.example.test:8443/v1?empty=#frag", True)
    opened, locked = other.open_json_map(stored, BODY, "p")
    assert opened == {} and locked
