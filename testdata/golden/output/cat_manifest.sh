exec cat -- /srv/dispatch/out/01J0000000000000000000000A/s1.manifest
