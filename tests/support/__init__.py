"""What the tests share: the services they control, the processes they start, the stores they clean."""
