"""The engine and what it stands on: rounds, verification, the KV rule, the trace, k per round."""
