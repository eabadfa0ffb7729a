"""The checkpoint formats the integrations check from their metadata alone, never their weights: a
safetensors header (``safetensors``), ``torch.save``'s zip archive (``torch_zip``), a
``torch.distributed.checkpoint`` folder's ``.metadata`` (``dcp_metadata``) and a DeepSpeed tag
folder's files (``deepspeed_tags``)."""
