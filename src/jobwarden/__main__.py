from jobwarden.cli.main import console_entry

console_entry()
