"""The ICL methods behind one signature and candidate scoring."""
