#!/usr/bin/python3
"""tests/fuzz/make-elf-seeds.py: writes the seed corpus of fuzz-elf (tests/fuzz/corpus/elf/),
tiny hand-made ELF64 images for plugin-check's symbol reader (tools/elf_exports.c). ok-* seeds
are well formed (one with its symbols and section headers at odd offsets) and must be read;
the others are damaged in one way each and must be refused or read, never crash.
Run from the source tree: python3 tests/fuzz/make-elf-seeds.py"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "elf")
SHT_STRTAB, SHT_DYNSYM = 3, 11
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
STV_DEFAULT, STV_HIDDEN = 0, 2


def ehdr(shoff, shnum, cls=2, data=1):
    ident = b"\x7fELF" + bytes([cls, data, 1, 0]) + bytes(8)
    # e_type ET_DYN, e_machine x86-64; no program headers
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                               shnum, 1)


def shdr(name, typ, off, size, link=0, entsize=0):
    return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, link, 0, 1, entsize)


def sym(name, bind, vis=STV_DEFAULT, shndx=1):
    return struct.pack("<IBBHQQ", name, bind << 4 | 2, vis, shndx, 0, 0)


def image(syms, strs, sym_pad=0, sh_pad=0, link=1, sym_size=None, strs_term=True):
    """Ehdr, the string table, the symbols (after sym_pad bytes), the section headers (after
    sh_pad bytes): null, .dynstr, .dynsym."""
    if not strs_term:
        strs = strs.rstrip(b"\0")
    body = bytearray(ehdr(0, 0))
    str_off = len(body)
    body += strs
    while len(body) % 8:
        body += b"\0"
    body += bytes(sym_pad)
    sym_off = len(body)
    table = b"".join([bytes(24)] + syms)
    body += table
    while len(body) % 8:
        body += b"\0"
    body += bytes(sh_pad)
    sh_off = len(body)
    body += bytes(64)
    body += shdr(0, SHT_STRTAB, str_off, len(strs))
    body += shdr(0, SHT_DYNSYM, sym_off, len(table) if sym_size is None else sym_size, link, 24)
    body[:64] = ehdr(sh_off, 3)
    return bytes(body)


STRS = b"\0tessera_plugin_entry\0extra_helper\0_init\0"
ENTRY, EXTRA, INIT = 1, 22, 35
good = [sym(ENTRY, STB_GLOBAL), sym(INIT, STB_GLOBAL)]
extra = good + [sym(EXTRA, STB_WEAK), sym(EXTRA, STB_GLOBAL, STV_HIDDEN),
                sym(EXTRA, STB_LOCAL), sym(EXTRA, STB_GLOBAL, shndx=0)]
seeds = {
    "ok-entry-only": image(good, STRS),
    "ok-extra-export": image(extra, STRS),
    # symbols at 5 mod 8 and section headers at 3 mod 8: read through memcpy or not at all
    "ok-misaligned-symtab": image(extra, STRS, sym_pad=5, sh_pad=3),
    "truncated-ehdr": image(good, STRS)[:40],
    "not-elf": b"hello, world\n",
    "elf32": image(good, STRS)[:4] + b"\x01" + image(good, STRS)[5:],
    "big-endian": image(good, STRS)[:5] + b"\x02" + image(good, STRS)[6:],
    "symtab-size-wraps": image(good, STRS, sym_size=(1 << 64) - 8),
    "bad-sh-link": image(good, STRS, link=99),
    "st-name-past-strtab": image([sym(4000, STB_GLOBAL)], STRS),
    "unterminated-name": image([sym(INIT, STB_GLOBAL)], STRS, strs_term=False),
}
shoff_past = bytearray(image(good, STRS))
shoff_past[0x28:0x30] = struct.pack("<Q", (1 << 64) - 16)
seeds["shoff-past-end"] = bytes(shoff_past)

os.makedirs(OUT, exist_ok=True)
for name, data in sorted(seeds.items()):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    print("%s: %d bytes" % (name, len(data)))
