"""The many-rank layer every integration rides on when a process group runs: the record of a
checkpoint once every rank's files are durable, and one resume decision for every rank
(``protocol``), over the ``torch.distributed`` collectives it calls (``collectives``)."""
