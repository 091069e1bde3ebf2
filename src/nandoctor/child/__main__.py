"""`python -m nandoctor.child OPTIONS.json`: run the user's script under instrumentation."""

from nandoctor.child.bootstrap import main

main()
