"""The helpers of ``trainstatus.integrations.deepspeed``, beside it."""
