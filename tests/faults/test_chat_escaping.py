"""Chat formats show what a label, annotation or job holds; they never let it mention a
channel, a person, or make a link."""

from __future__ import annotations

import json

from gpuwatch.model import NotifyAlert, fingerprint
from gpuwatch.notify import formats
from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.message import GpuIdentity, Notification
from gpuwatch.text.secrets import Secret

T0 = 1_800_000_000.0
HOSTILE = "<!channel> <@U123> <https://evil.example|click> @channel @here [x](https://evil.example)"


def rendered(kind: str) -> str:
    labels = (("alertname", "GpuFellOffBus"), ("gpu", "0"), ("job", HOSTILE),
              ("severity", "critical"))  # fmt: skip
    notes = (("description", HOSTILE), ("summary", HOSTILE))
    a = NotifyAlert(labels, notes, T0, None, 1.0, fingerprint(labels))
    gpus = {"0": GpuIdentity("H100", "1654922000001", "GPU-1", f"Slurm job 81234 of {HOSTILE}")}
    n = Notification(kind, "g", labels, (a,), T0, "node-1", "http://gpuwatch:10040", gpus=gpus)
    receiver = ReceiverConfig(kind, kind, Secret("http://127.0.0.1:9/", "inline"), True)
    return json.dumps(json.loads(formats.render(receiver, n).body), ensure_ascii=False)


def mrkdwn_texts(body: str) -> list[str]:
    """Every text Slack parses as mrkdwn (the plain_text header is shown as is)."""
    payload = json.loads(body)
    texts = [payload["text"]]
    for block in payload["attachments"][0]["blocks"]:
        if block["type"] == "section":
            texts.append(block["text"]["text"])
        for element in block.get("elements", []):
            texts.append(element["text"])
    return texts


def test_slack_escapes_its_control_characters() -> None:
    texts = mrkdwn_texts(rendered("slack"))
    joined = "\n".join(texts)
    for dangerous in ("<!channel>", "<@U123>", "<https://evil.example|click>"):
        assert dangerous not in joined
    assert joined.count("&lt;!channel&gt;") >= 3  # summary, description and the job: shown
    assert "<http://gpuwatch:10040/api/v1/alerts|Open in gpuwatch on node-1>" in joined


def test_mattermost_breaks_mentions_and_links() -> None:
    payload = json.loads(rendered("mattermost"))
    text = payload["text"] + payload["attachments"][0]["text"]
    for mention in ("@channel", "@here", "@U123"):
        assert mention not in text
    assert "@\u2060channel" in text
    assert "[x](https://evil.example)" not in text
    assert "\\[x\\]\\(https://evil.example\\)" in text
    assert "[Open in gpuwatch on node-1](http://gpuwatch:10040/api/v1/alerts)" in text
