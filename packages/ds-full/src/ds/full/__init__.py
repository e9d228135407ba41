"""ds.full: the composition root that wires every ds distribution together."""
