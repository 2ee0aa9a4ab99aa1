"""What runs beside the calls, in the background thread: lease renewal (:mod:`.leases`), the
writes a call hands on when it cannot finish them itself (:mod:`.repairs`), and the
in-process single flight of callers of one key (:mod:`.singleflight`)."""
