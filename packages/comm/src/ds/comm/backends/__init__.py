"""Communication backends behind the ``ds.interfaces.comm.Communicator`` contract."""
