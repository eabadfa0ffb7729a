"""The helpers of ``trainstatus.integrations.accelerate``, beside it."""
