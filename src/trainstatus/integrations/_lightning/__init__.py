"""The helpers of ``trainstatus.integrations.lightning``, beside it."""
