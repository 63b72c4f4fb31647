"""Text of the views shared by the frontends: tables, reports, the terminal's width and colour."""
