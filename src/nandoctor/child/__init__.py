"""What runs inside the child process, around the user's script."""
