"""The session as a loop: what each test leaves behind, who holds it, and the session's account."""
