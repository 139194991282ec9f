"""Supervision: the loop runtime, supervisors and tables (ARCHITECTURE.md, "Actors on
thespian", "Supervisors", "Tables")."""
