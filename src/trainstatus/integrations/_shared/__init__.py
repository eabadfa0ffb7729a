"""What every integration shares whether or not it runs on many ranks: the resume's choice of the
newest whole checkpoint (``choice``) and the upkeep of the list and its folder (``upkeep``)."""
