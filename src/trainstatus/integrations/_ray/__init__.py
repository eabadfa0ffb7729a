"""The helpers of ``trainstatus.integrations.ray``, beside it."""
