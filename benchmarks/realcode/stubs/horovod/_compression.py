"""Single-worker stand-in for horovod's gradient compressors: they change nothing, since the
stub's allreduce sends nothing anywhere."""


class _Identity:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class Compression:
    none = _Identity
    fp16 = _Identity
