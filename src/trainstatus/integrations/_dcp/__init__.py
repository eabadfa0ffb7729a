"""The helpers of ``trainstatus.integrations.dcp``, beside it."""
