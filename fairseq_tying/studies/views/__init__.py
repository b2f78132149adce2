"""What a study shows: a view per report block, their formatting and plots, the reports."""
