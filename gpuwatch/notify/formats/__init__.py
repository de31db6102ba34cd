"""One module per service; `render` picks the receiver's."""

from __future__ import annotations

from collections.abc import Callable

from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats import discord, mattermost, pagerduty, slack, teams, webhook
from gpuwatch.notify.message import Notification

FORMATS: dict[str, Callable[[ReceiverConfig, Notification], Outgoing]] = {
    "webhook": webhook.render,
    "slack": slack.render,
    "mattermost": mattermost.render,
    "teams": teams.render,
    "discord": discord.render,
    "pagerduty": pagerduty.render,
}


def render(receiver: ReceiverConfig, notification: Notification) -> Outgoing:
    return FORMATS[receiver.type](receiver, notification)
