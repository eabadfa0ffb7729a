"""What every integration shares whether or not it runs on many ranks: the resume's choice of the
newest whole checkpoint (``choice``), the upkeep of the list and its folder (``upkeep``), the
refusal of a status file inside a checkpoint folder (``inside``), and the run lease that keeps a
second job off a running one's status file (``lease``)."""
