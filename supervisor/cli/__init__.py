"""`supervisor ...` commands by area; apps add theirs through an entry-point group."""
