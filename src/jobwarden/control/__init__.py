"""What a user asks for: run, stop, adopt, remove, and the views of jobs. Frontends act only through here."""
