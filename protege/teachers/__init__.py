"""Teachers behind one interface, and the content-addressed cache of their answers."""
