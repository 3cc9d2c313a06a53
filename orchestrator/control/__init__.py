"""The experiment loop and Ray: the controller, the drive loop (and its repetition design),
node actors, cluster start-up. The only package that knows about Ray."""
