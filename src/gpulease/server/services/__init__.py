"""Business rules, one function per action, each taking the session first."""
