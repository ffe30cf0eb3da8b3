import os, sys
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'triton_serial.py')).read().split("fails = 0")[0])
from pytest_attnkit.implementations.triton_flash.launch import Tiles
for causal in (False, True):
    for tk in (Tiles(32,64,4,3), Tiles(32,128,4,3), Tiles(64,64,4,3), Tiles(64,64,4,2), Tiles(32,64,4,2), Tiles(64,64,8,3), Tiles(32,64,8,3)):
        b,h,n,d=1,2,1024,64
        q=torch.zeros(b,h,n,d,dtype=torch.bfloat16); k=torch.zeros_like(q); v=torch.zeros_like(q); o=torch.zeros_like(q); lse=torch.zeros(b,h,n)
        compiled.clear()
        try:
            launch.flash_bwd(q,q,k,v,o,lse,causal,d**-0.5,tiles={"dkdv":tk,"dq":Tiles(64,64,4,3)},gluon=False)
            print('causal' if causal else 'full', tk, [c for c in compiled if 'dkdv' in c])
        except Exception as e: print(tk, 'FAILED', str(e)[:200])
