"""Delivery: where questions reach people besides the page and the API (webhooks, email, Slack,
Teams, PagerDuty, commands), and where their answers come back through the one answering path
(`deltad.inbox.submit`). The core composes and hands off; the inbox process sends.

Root core:
    hub.py      the feed's events to every channel, on a thread beside the daemon's loop
    notify.py   webhook documents and the webhook intake (`Notifier`)
    email.py    questions as mail; replies, relayed by the inbox process, checked and answered
    slack.py    questions as Block Kit messages; interactions checked and answered
    teams.py    questions as Adaptive Cards; Bot Framework activities checked and answered
    pagerduty.py  escalations as PagerDuty alerts, resolved when the question closes
    base.py     the interface a channel implements, and what it is given (`Context`)
    grants.py   signed, expiring, single-use reply addresses
    mail.py, blocks.py   composing and reading mail and Slack blocks (pure)
    config.py   the `channels:` section of the configuration
Inbox process (unprivileged):
    courier.py  a target's durable outbox: take new, retry the due, dead-letter
    senders.py  the transports: SMTP, Slack's Web API, PagerDuty, the Bot Connector, commands
    botauth.py  the Bot Connector's keys, fetched; its JWTs checked (the core checks again)
    maildir.py  the Maildir, read and parsed, never as root
Both (the shared contract):
    outbox.py   the outbox's files and retry rule; webhooks.py Standard Webhooks signing
"""
