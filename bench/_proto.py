import time, asyncio
from bench import mesh
from trellis_catalog import sources
from trellis_catalog.catalog import Catalog
from trellis_common.documents.base import Origin

reg = sources.kinds()


async def announce(a, b):
    return 0


for n in (100, 250, 500, 1000):
    m = mesh.generate(n)
    t = time.perf_counter()
    docs = [reg.parse(r, Origin("mesh", i)) for i, r in enumerate(m.documents)]
    tp = time.perf_counter() - t
    t = time.perf_counter()
    c = Catalog(announce)
    c.set_documents(docs, [])
    c.set_provider_services("bench", m.reports)
    for p in m.proxies:
        c.expect_proxy(p.common_name, p.service_account)
    b = c.flush()
    tb = time.perf_counter() - t
    r = m.reports[5]
    t = time.perf_counter()
    c.update_provider_service("bench", r.namespace, r.name, mesh.moved(r, 0, 1 << 23))
    b2 = c.flush()
    tc = time.perf_counter() - t
    print(
        n,
        m.describe(),
        f"parse {tp * 1000:.0f} build {tb * 1000:.0f} change {tc * 1000:.1f} ids {len(b.identities)} {len(b2.identities) if b2 else 0}",
        flush=True,
    )
