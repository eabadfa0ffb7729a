"""What every integration shares whether or not it runs on many ranks: the resume's choice of the
newest whole checkpoint (``choice``), the upkeep of the list and its folder (``upkeep``), and the
refusal of a status file inside a checkpoint folder (``inside``)."""
