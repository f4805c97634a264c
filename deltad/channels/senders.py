"""How a channel's message leaves the machine, as the inbox process does it (deltad/privsep):
the core composes each message and hands it over (deltad/channels/courier.py, `Handed`); the
inbox sends it with the credential it was handed at connect (wire.ChannelTarget), never as
root and never with a workspace in reach.

    target(name, ...)   the core's side: a channel's settings and credential, read once
    sender(target)      the inbox's side: the function its courier sends each message with

Each kind says what a message is (`Delivery.body`) and when a failure is permanent (straight
to the dead letter) rather than retried:

    smtp     body: the whole RFC 5322 message; `url`: the one recipient. A 5xx is permanent.
"""

from __future__ import annotations

import smtplib
import ssl
from typing import Any

from deltad.api.outbox import Delivery, target_key
from deltad.privsep import wire

from .config import EmailConfig, OutboxConfig
from .courier import Failed, Send

CA_MAX = 1024 * 1024  # bytes of a CA bundle handed to the inbox


class SenderError(ValueError):
    """One line: a target's settings cannot be sent with."""


def _policy(outbox: OutboxConfig) -> dict[str, Any]:
    return {
        "max_attempts": outbox.max_attempts,
        "backoff_seconds": outbox.backoff_seconds,
        "backoff_max_seconds": outbox.backoff_max_seconds,
        "max_age_seconds": outbox.max_age_seconds,
        "outbox_max": outbox.outbox_max,
    }


def outbox_config(t: wire.ChannelTarget) -> OutboxConfig:
    return OutboxConfig(
        max_attempts=t.max_attempts,
        backoff_seconds=t.backoff_seconds,
        backoff_max_seconds=t.backoff_max_seconds,
        max_age_seconds=t.max_age_seconds,
        outbox_max=t.outbox_max,
    )


# -- SMTP -----------------------------------------------------------------------------------------
def email_target(config: EmailConfig, name: str = "email") -> wire.ChannelTarget:
    """The email channel's sending, as the inbox is handed it: the MTA, the From, the
    password (read here, by the core) and the CA file's certificates (the inbox may not read
    the file itself). OSError/ValueError, one line, if a file cannot be read."""
    s = config.smtp
    ca = None
    if s.ca_file is not None:
        with open(s.ca_file, "rb") as f:
            data = f.read(CA_MAX + 1)
        if len(data) > CA_MAX:
            raise ValueError(f"email.smtp.ca_file {s.ca_file}: over {CA_MAX} bytes")
        ca = data.decode("ascii", "replace")
    return wire.ChannelTarget(
        name=name,
        key=target_key(name),
        kind="smtp",
        settings={
            "host": s.host,
            "port": s.port,
            "security": s.security,
            "username": s.username,
            "timeout_seconds": s.timeout_seconds,
            "from_address": config.from_address,
            "ca": ca,
        },
        secret=s.password.read().decode() if s.password is not None else None,
        **_policy(config.outbox),
    )


def _permanent(codes: list[int]) -> bool:
    return bool(codes) and all(c >= 500 for c in codes)


def smtp_sender(t: wire.ChannelTarget) -> Send:
    """One attempt at handing a message to the MTA per call; None once it took it."""
    s = t.settings
    try:
        host, port, security = str(s["host"]), int(s["port"]), str(s["security"])
        timeout, sender = float(s["timeout_seconds"]), str(s["from_address"])
        username = s.get("username")
        ca = s.get("ca")
        tls = ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context()
    except (KeyError, TypeError, ValueError, ssl.SSLError) as e:
        raise SenderError(f"{t.name}: the SMTP settings: {e}") from None
    password = t.secret

    def send(d: Delivery) -> Failed | None:
        try:
            if security == "tls":
                conn: smtplib.SMTP = smtplib.SMTP_SSL(host, port, timeout=timeout, context=tls)
            else:
                conn = smtplib.SMTP(host, port, timeout=timeout)
            with conn:
                if security == "starttls":
                    conn.starttls(context=tls)
                if username is not None and password is not None:
                    conn.login(str(username), password)
                conn.sendmail(sender, [d.url], d.body.encode())
        except smtplib.SMTPRecipientsRefused as e:
            codes = [c for c, _ in e.recipients.values()]
            return Failed(f"refused recipient ({codes[0] if codes else '?'})", _permanent(codes))
        except smtplib.SMTPResponseException as e:
            return Failed(f"SMTP {e.smtp_code}", e.smtp_code >= 500)
        except (smtplib.SMTPException, OSError) as e:
            return Failed(type(e).__name__ + (f": {e}" if str(e) else ""))
        return None

    return send


def sender(t: wire.ChannelTarget) -> Send:
    """How the inbox sends `t`'s messages (SenderError, one line, for settings it cannot use)."""
    if t.kind == "smtp":
        return smtp_sender(t)
    raise SenderError(f"{t.name}: the inbox cannot send {t.kind} messages")
