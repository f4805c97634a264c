"""This repository's own test and bench harness (not shipped in the wheel): a real `deltad serve`
subprocess and its JSON log (`daemon`), tokens and HTTP helpers for it (`inbox`), a one-node
Slurm cluster and its outage scenario (`slurmcluster`, `slurmoutage`), Slack's Web API and a
webhook receiver on 127.0.0.1 (`slackapi`, `webhooks`). The public doubles stay in
`deltad.testing`."""
